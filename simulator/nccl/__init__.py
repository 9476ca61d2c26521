"""nccl-tests logs: reading them, validating the collectives against them, and calibrating a topology from them."""
