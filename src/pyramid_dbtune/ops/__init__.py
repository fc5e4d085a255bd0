"""Operations: the timing tween, stats, the profiler, the probes, the
dashboard, and who may see them."""
