"""Scale-out by market: HAProxy's consistent-hash ring, its configuration, rebalancing and model rollout."""

REPLICA_TIMEOUT_S = 30.0  # default seconds a call of rebalance or rollout waits for a replica (--timeout)
