"""Collectives: time-division multiplexing of in-network aggregation among training jobs (mechanism E).

Mechanisms: `agent` (a rank's AllReduce queue, launching one collective at a time), `switch` (the
aggregation service that plays an in-network-aggregation switch on machines without SHARP), `collnet`
(NCCL's CollNet/SHARP communicator on clusters that have it), `controller` (the shared controller and
its consensus protocol). Policies: `decision` (which AllReduce gets the switch), `score` (CalcScore).
`simulator` replays a cluster at scale with every policy side by side.
"""
