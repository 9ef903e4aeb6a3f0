"""The engine simulator: a continuous-batching inference engine that benchmarks stand on.

Layers, from the bottom:
- pure model (no I/O, no clock reads; time is passed in): `params`, `tokens`, `kvcache`,
  `records`, `sglang`, `core`, `script`, `wire`, `ratelimit`, `metrics`;
- shell: `driver` runs the core in real time, `server` answers HTTP (with `replies` writing
  the streams); `main` parses the command line.

`luftpause fake-engine --help` lists every parameter; the test kit's README explains the model
and how its defaults were calibrated against llama.cpp.
"""
