"""The report room: results -> Markdown/HTML pages and figures (:mod:`.pages`), the bounded per-rank timeline
(:mod:`.timeline`), Chrome/Perfetto traces (:mod:`.trace`), Markdown tables (:mod:`.markdown`). Only this room
draws."""
