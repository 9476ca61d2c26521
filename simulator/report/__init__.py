"""The report room: results -> Markdown/HTML pages and figures (:mod:`.pages`: a run's report; :mod:`.plan_report`:
a plan's), what they conclude (:mod:`.conclude`), faceted figures (:mod:`.figures`), the bounded per-rank timeline
(:mod:`.timeline`), the page model rendered as Markdown and HTML (:mod:`.document`), Chrome/Perfetto traces
(:mod:`.trace`), Markdown tables (:mod:`.markdown`). Only this room draws."""
