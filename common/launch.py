"""Running the entry scripts in ``launch/`` as plain files.

``python launch/pretrain.py`` (and ``deepspeed``/``torchrun``, which run it the same way) puts
``launch/`` first on ``sys.path``, where ``launch/pretrain.py`` would shadow the ``pretrain``
package (and ``launch/finetune.py`` the ``finetune`` package). Scripts whose names match a package
call :func:`repo_root_first` before importing the packages.
"""

from __future__ import annotations

import os
import sys


def repo_root_first(script: str) -> None:
    """Replace the script's own directory at the head of ``sys.path`` with the repository root."""
    launch_dir = os.path.dirname(os.path.abspath(script))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == launch_dir:
        sys.path[0] = os.path.dirname(launch_dir)
