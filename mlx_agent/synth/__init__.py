"""Task synthesis from a tool catalogue alone: ``mlx_agent synth``.

``values`` samples arguments from JSON schemas out of split value pools (``pools``),
``phrasing`` words requests through template families split the same way, ``tasks`` builds
the four kinds of task, and ``synthesis`` (the entry point: ``synthesize``, ``write``) plans
both sides, measures their overlap and writes the files; ``config`` holds the options and
their defaults. ``file_work`` writes everyday file work with the built-in tools over
generated folders, as people ask for it (the general adapter's corpus). Nothing here loads
a model. The package imports nothing itself, so the CLI can read the defaults without
loading the rest.
"""
