"""The bench's figures, one module each: ``FIGURE``, a :class:`harness.Figure`, and how it is measured."""
