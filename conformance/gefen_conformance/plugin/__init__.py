"""The pytest plugin and its session (SPEC 4.1, 4.4.9-4.4.11).

``hooks`` is the ``pytest11`` entry point: it adds the ``--impl`` family of options (``options``,
with their checks before anything runs) and stays inert until ``--impl`` is given; suite modules
get their fixtures from ``fixtures``.
The rest is what a certifying session holds: which suite tests run (``selection``), what each
produced (one ``report_record`` per report, gathered by ``recorder``), the hypothesis profiles
(``hypothesis_profiles``), what rank processes preload and prepare (``rank_preload``,
``warmup``: the implementation's warm-up before any deadline) and Ctrl-C (``interrupts``).
"""
