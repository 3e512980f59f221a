"""Benchmarks of lookup latency, ingestion throughput and scaling (``make bench``)."""
