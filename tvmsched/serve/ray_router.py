"""The replicas' request router on Ray Serve (its request-router API; docs/scale-out.md): a request goes to a replica
that holds its model, or is loading it, for as long as one of them has room in its queue.

The replicas are the application's ingress, so Ray's proxies route to them directly. A request's model is the one
its URL path names (/v2/models/NAME/...: tritonclient never sends the header Ray's multiplexing keys on), or its gRPC
message's `model_name` (or `name`), read from what the proxy hands the replica (`request_model`); a handle's call
with `multiplexed_model_id` names it too. A request naming none (liveness, server metadata) goes to any replica.

Ray's default router (power of two choices with multiplexing) prefers such a replica only on its first try: when that
try fails, because the replica's queue is full or only because its queue length did not come back within 0.1 s (a
loaded machine), the next try takes the replicas that hold the fewest models. There the model is loaded and another
evicted, so a busy machine thrashes: on a loaded CI runner 17 of 150 requests loaded their model (89% reached a holder,
the goal is 95%). Here the next try goes to the holders again, with a longer deadline, and a model moves to another
replica only when every holder's queue is known to be full, or no live replica holds it.

A replica reports the models it holds through Ray's controller (every 0.1 s, then a long poll to each router), which
lags on a loaded machine. So the router also counts as a holder each replica it sent the model to and whose report
does not show it yet (`_sent`, for at most `SENT_KEPT_S`): a burst of requests for a model loads it once, not on every
replica, and a late report does not send the model's next requests elsewhere. Once a report shows the model there,
the reports alone say where it is (an eviction included).
"""

import pickle
import random
import re
import time

from ray.serve.request_router import MultiplexMixin, PendingRequest, RequestRouter, RunningReplica

SENT_KEPT_S = 10.0  # the longest a replica sent a model counts as its holder without a report saying so


_MODEL_PATH = re.compile(r"/v2/models/([^/]+)(?:/|$)")  # (after the application's route prefix)


def request_model(pending_request: PendingRequest) -> str:
    """The model a request names ("" where none): its `multiplexed_model_id`, else the model of the HTTP request's path
    or of the gRPC message that Ray's proxy sends (pickled: its ASGI scope, or the message). Kept on the request."""
    model = pending_request.metadata.multiplexed_model_id
    if model:
        return model
    model = getattr(pending_request, "tvmsched_model", None)
    if model is None:
        model, arg = "", None
        metadata = pending_request.metadata
        if (metadata.is_http_request or metadata.is_grpc_request) and pending_request.args:
            try:  # (pickled by Ray's proxy in this process; a handle's own call is neither kind)
                arg = pickle.loads(pending_request.args[0])
            except Exception:  # noqa: BLE001 - not what a proxy sends: no model
                arg = None
        scope = getattr(arg, "asgi_scope", None)
        message = getattr(arg, "user_request_proto", None)
        if isinstance(scope, dict) and (match := _MODEL_PATH.search(scope.get("path", ""))):
            model = match[1]
        elif message is not None:
            model = getattr(message, "model_name", "") or getattr(message, "name", "")
        pending_request.tvmsched_model = model
    return model


class HolderFirstRouter(MultiplexMixin, RequestRouter):
    def initialize_state(self, **kwargs):
        self._sent: dict[str, dict] = {}  # model -> {replica id: when it was sent there, not reported there yet}
        self._swept = time.monotonic()

    def _sweep(self) -> None:
        """Forget every sent model past SENT_KEPT_S (names asked for once, a hostile client's included), at most once
        per SENT_KEPT_S."""
        now = time.monotonic()
        if now - self._swept > SENT_KEPT_S:
            self._swept = now
            for model in list(self._sent):
                self._held(model)
                if not self._sent[model]:
                    del self._sent[model]

    def _held(self, model: str) -> set:
        """The replicas that hold the model or are loading it, as reported or as sent."""
        reported = self._multiplexed_model_id_to_replica_ids.get(model, set())
        sent = self._sent.get(model, {})
        now = time.monotonic()
        for replica_id in [r for r, at in sent.items() if r in reported or now - at > SENT_KEPT_S]:
            del sent[replica_id]
        return reported | set(sent)

    def _holds(self, replica: RunningReplica) -> int:
        """How many models the replica holds, as reported or as sent."""
        return len(set(replica.multiplexed_model_ids)
                   | {m for m, sent in self._sent.items() if replica.replica_id in sent})

    def _queued(self, replica: RunningReplica) -> int:
        queued = self.replica_queue_len_cache.get(replica.replica_id)
        return 0 if queued is None else queued

    def _full(self, replica: RunningReplica) -> bool:
        return self._queued(replica) >= replica.max_ongoing_requests

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        model = request_model(pending_request) if pending_request is not None else ""
        if not model:
            return [random.sample(candidate_replicas, len(candidate_replicas))]
        pending_request.routing_context.should_backoff = True  # a failed try waits before the next
        self._sweep()
        held = self._held(model)
        holders = [r for r in candidate_replicas if r.replica_id in held]
        with_room = [r for r in holders if not self._full(r)]
        if with_room:
            return [random.sample(with_room, len(with_room))]  # (the one of them with the shortest queue is taken)
        others = [r for r in candidate_replicas if r.replica_id not in held and not self._full(r)]
        if not others:
            return [holders or candidate_replicas]  # every replica is full: wait for room
        chosen = min(others, key=lambda r: (self._holds(r), self._queued(r), random.random()))
        self._sent.setdefault(model, {})[chosen.replica_id] = time.monotonic()
        return [[chosen]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        model = request_model(pending_request)
        if model and replica_id not in self._held(model):
            self._sent.setdefault(model, {})[replica_id] = time.monotonic()
