"""A whole training step at cluster scale: tensor, context, pipeline and data parallelism (docs/training.md).

``layer`` simulates one layer's pieces on the engine, ``pipeline`` times 1F1B over the stages, ``dp`` the data
parallel collectives and their overlap with the backward, ``memory`` a rank's peak by ZeRO stage and recompute,
``step`` composes them.
"""
