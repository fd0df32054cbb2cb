"""A data-parallel training job whose AllReduces go through a tvmsched collectives agent.

One process per rank; the ranks of a job rendezvous on 127.0.0.1:MASTER_PORT (Gloo). With
--controller and --switch, every DDP gradient bucket goes through the agent (mechanism E: the job's
AllReduces take the aggregation service or run ring, as the agreed state decides); with --reference,
plain DDP (its own AllReduce hook), for comparing gradients. Writes one JSON report per rank.

    python examples/ddp_train.py --job A --rank 0 --world 2 --master-port 29500 \\
        --controller 127.0.0.1:7000 --switch 127.0.0.1:7001 --steps 20 --out A0.json
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from tvmsched.runtime.collectives import agent as collectives


def model(width: int, depth: int) -> nn.Module:
    layers = [nn.Linear(64, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--master-port", type=int, required=True)
    ap.add_argument("--controller")
    ap.add_argument("--switch")
    ap.add_argument("--reference", action="store_true", help="plain DDP, no agent")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--compute-ms", type=float, default=0.0,
                    help="extra compute per step, as a larger model on an accelerator would take (a sleep)")
    ap.add_argument("--bucket-mb", type=float, default=0.25)
    ap.add_argument("--link-gbps", type=float)
    ap.add_argument("--drop-replies", type=float, default=0.0, help="lose this fraction of the agent's protocol replies")
    ap.add_argument("--timeout", type=float, default=20.0, help="process-group timeout (a dead peer fails the job)")
    ap.add_argument("--wait-state", type=float, default=0.0, help="wait up to this long for a first agreed state")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    try:  # a peer that dies before training starts fails this rank here, with a report
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.master_port}", rank=args.rank,
                                world_size=args.world, timeout=datetime.timedelta(seconds=args.timeout))
        torch.manual_seed(0)
        net = model(args.width, args.depth)
        ddp = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=args.bucket_mb)
    except Exception as err:
        Path(args.out).write_text(json.dumps({"job": args.job, "rank": args.rank, "steps": [], "error": _error(err)}))
        raise SystemExit(1) from None
    agent = None
    if not args.reference:
        agent = collectives.Agent(args.job, controller=args.controller, switch=args.switch, steps=args.steps,
                                  link_gbps=args.link_gbps, drop_replies=args.drop_replies, seed=args.rank)
        ddp.register_comm_hook(agent, collectives.ddp_hook)
        deadline = time.time() + args.wait_state
        while agent.state.version == 0 and time.time() < deadline:
            time.sleep(0.01)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1000 + args.rank)
    report = {"job": args.job, "rank": args.rank, "steps": [], "error": None}
    start = time.time()
    try:
        for _ in range(args.steps):
            t0 = time.time()
            x = torch.randn(args.batch, 64, generator=gen)
            y = torch.randint(0, 10, (args.batch,), generator=gen)
            if args.compute_ms:
                time.sleep(args.compute_ms / 1000)
            loss = nn.functional.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            report["steps"].append(time.time() - t0)
            if len(report["steps"]) == 1:
                Path(args.out + ".running").touch()  # for whoever waits for training to be under way
    except Exception as err:  # a dead peer: the job fails (it never hangs: the process group times out)
        report["error"] = _error(err)
    report["jct_s"] = time.time() - start
    params = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    report["params_sha"] = hashlib.sha256(params.numpy().tobytes()).hexdigest()
    report["params"] = params[:: max(1, params.numel() // 4096)].tolist()
    if agent is not None:
        report["decisions"] = list(agent.decisions)
        report["rounds"] = agent.rounds
        report["stats"] = agent.stats()
        agent.close()
    with open(args.out, "w") as f:
        json.dump(report, f)
    if report["error"] is None:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
