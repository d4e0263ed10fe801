"""Engine: market state pool, micro-batching and backends."""
