"""Scale-out by market: HAProxy's consistent-hash ring, its configuration, rebalancing and model rollout."""

REPLICA_TIMEOUT_S = 30.0  # default seconds a call of rebalance waits for a replica (--timeout)
# rollout's default: each replica receives a model archive (hundreds of MB for a production-size network), checks it
# and stores it with fsync before it answers
ROLLOUT_TIMEOUT_S = 120.0
