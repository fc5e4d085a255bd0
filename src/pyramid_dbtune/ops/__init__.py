"""Operations: what an operator sees of the site, and who may see it.

The timing tween, stats, the profiler, the probes, the dashboard, and
their access.
"""
