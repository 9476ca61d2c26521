"""Real runs of treering schedules on ``torch.distributed`` (gloo on CPU, NCCL on CUDA): the only torch.distributed
code in the project.

* :mod:`.runner` executes one rank of a :class:`~simulator.schedule.core.Schedule` with the same merge core as the
  numeric executor;
* :mod:`.launch` starts P local worker processes (or you start them with ``torchrun``) and tears them all down
  when one fails or the timeout passes;
* :mod:`.validate` times real runs against the simulator's prediction (training steps: :mod:`.train_run`, a small
  model over TP x CP x PP x DP with the attention by the prefill schedules, checked against single-process
  autograd); :mod:`.calibrate` measures a machine and writes a topology the simulator can load.
"""
