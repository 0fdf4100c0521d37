"""Cloud emulators for tests and benchmarks: dev-only, never installed with coadapt.

* ``emulators.aws_moto`` — a moto server child process and the botocore hooks that add what
  moto does not model (EC2 capacity errors, ``MaxCount`` launches, EventBridge notices).
* ``emulators.gce_server`` — ``FakeGceServer``, a fake Compute Engine REST server (stdlib only).
* ``emulators.gcp_env`` — ``FakeGcpEnv``: that server plus a ``GcpProvider`` wired to it.

Why a top-level package, and not ``tests/`` or ``providers/``: the emulators are used by the
test suite *and* by ``benchmarks/provider_ops.py``; a benchmark importing from the ``tests``
tree would depend on test layout and pytest-only conventions, while inside ``providers`` they
shipped in the wheel, a moto launcher among them, to every user. As a
sibling of ``autoscaler``/``providers``/``trainer`` it is importable from a checkout (tests run
from the repository root; the benchmark puts the root on ``sys.path``) and is left out of the
wheel by ``[tool.setuptools.packages.find]`` in ``pyproject.toml``, which
``tests/providers/test_wheel_contents.py`` checks on a really built wheel.

``providers.fake.FakeProvider`` is not an emulator of a cloud API but the behavioural fake of
coadapt's own provider contract, used by the simulator; it stays in ``providers``.
"""
