"""Graph passes of the PT2E flow: one pass per module, each edits the graph in place and leaves it
valid (``graph.lint()``).

They read facts from :mod:`qviz.engine.graph` and never import the flow
(:mod:`qviz.engine.pt2e`'s other modules), which calls them.
"""
