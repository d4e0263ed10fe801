"""Scale-out by market: HAProxy's consistent-hash ring, its configuration, rebalancing and model rollout."""
