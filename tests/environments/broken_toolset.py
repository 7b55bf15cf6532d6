"""A toolset that cannot load: importing it raises."""

raise RuntimeError("this toolset is broken on purpose")
