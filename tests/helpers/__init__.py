"""Models, quantizers and backends that more than one test module uses."""
