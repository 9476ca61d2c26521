"""Model presets and a whole model's decode step or prefill."""
