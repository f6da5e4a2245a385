"""Multi-stage loops built on loaded stages, outside the runtime core (which knows stage kinds, not families).

`ttsaot.runtime.pipelines.voxcpm2`: the VoxCPM2 decode loop (base step → residual step → locdit → local encoder,
VAE streamed)."""
