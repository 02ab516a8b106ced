"""Showing a plan: the timeline as plain numbers (:mod:`.picture`), drawn as a chart or as text
(:mod:`.draw`). The CLI prints these; matplotlib is imported only to draw a chart.
"""

from autopipe.show.draw import draw_timeline, text_timeline

__all__ = ["draw_timeline", "text_timeline"]
