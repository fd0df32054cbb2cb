"""Models whose inputs are indices: BERT-tiny over token ids, and a DLRM-style recommender.

Their integer inputs index embedding tables at run time, so they exercise the bounds checks
(tvmsched.frontend.index_checks) and measure what the checks cost. Each integer input records its valid
range in the model's metadata (``index_range:<input>``), which :func:`random_inputs` reads.
"""

from __future__ import annotations

import numpy as np
import onnx

from .bert import HIDDEN, LAYERS, SEQ, encoder_layer, layer_norm
from .common import GraphBuilder, dense, make_model

VOCAB = 30522  # BERT's WordPiece vocabulary

DLRM_BATCH = 32
DLRM_DENSE = 13
DLRM_TABLES = 8
DLRM_ROWS = 40000
DLRM_DIM = 16
DLRM_POOL = 4  # ids per sample and table, summed (an embedding bag)


def build_bert_tiny_ids(seed: int = 0) -> onnx.ModelProto:
    """BERT-tiny from token ids: word + position embeddings, LayerNorm, then the bert-tiny encoder.

    Input ``input_ids`` is int64 (1, 128) in [0, 30522); output ``output`` is float32 (1, 128, 128).
    """
    g = GraphBuilder(seed)
    words = g.normal("embeddings.word", [VOCAB, HIDDEN], 0.02)
    positions = g.normal("embeddings.position", [1, SEQ, HIDDEN], 0.02)
    x = g.op("Gather", [words, "input_ids"], "embeddings.lookup", axis=0)
    x = g.op("Add", [x, positions], "embeddings.sum")
    x = layer_norm(g, x, "embeddings.ln")
    for i in range(LAYERS):
        x = encoder_layer(g, x, f"layer{i}", "output" if i == LAYERS - 1 else None)
    return make_model(g, "bert-tiny-ids", {"input_ids": [1, SEQ]}, {"output": [1, SEQ, HIDDEN]},
                      int_inputs={"input_ids": VOCAB})


def build_dlrm_small(seed: int = 0) -> onnx.ModelProto:
    """A DLRM-style click model: 8 embedding bags (40000 x 16 each) and two small MLPs.

    Inputs: ``dense`` float32 (32, 13) and ``ids0`` .. ``ids7`` int64 (32, 4) in [0, 40000);
    output ``output`` float32 (32, 1) click probabilities.
    """
    g = GraphBuilder(seed)
    x = g.op("Relu", [dense(g, "dense", "bottom.fc0", DLRM_DENSE, 64)], "bottom.relu0")
    features = [g.op("Relu", [dense(g, x, "bottom.fc1", 64, DLRM_DIM)], "bottom.relu1")]
    axes = g.const("bag.axes", np.array([1], dtype=np.int64))
    for t in range(DLRM_TABLES):
        table = g.normal(f"table{t}", [DLRM_ROWS, DLRM_DIM], 0.05)
        rows = g.op("Gather", [table, f"ids{t}"], f"bag{t}.lookup", axis=0)
        features.append(g.op("ReduceSum", [rows, axes], f"bag{t}.sum", keepdims=0))
    x = g.op("Concat", features, "interaction", axis=1)
    x = g.op("Relu", [dense(g, x, "top.fc0", DLRM_DIM * (DLRM_TABLES + 1), 64)], "top.relu0")
    g.op("Sigmoid", [dense(g, x, "top.fc1", 64, 1)], "output")
    ids = {f"ids{t}": [DLRM_BATCH, DLRM_POOL] for t in range(DLRM_TABLES)}
    return make_model(g, "dlrm-small", {"dense": [DLRM_BATCH, DLRM_DENSE], **ids}, {"output": [DLRM_BATCH, 1]},
                      int_inputs={name: DLRM_ROWS for name in ids})
