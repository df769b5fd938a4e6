"""On PYTHONPATH under ``speedpack doctor``: re-launched DDP ranks attach the same callbacks.

Only the interpreter that re-runs the doctored script (``sys.argv[0]`` equal to it) is touched;
DataLoader workers, tools and other Python processes start as usual. Any ``sitecustomize`` that
this file shadows is imported afterwards.
"""

import importlib
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
_script = os.environ.get("LIGHTNING_SPEEDPACK_DOCTOR_SCRIPT")
if _script and sys.argv and sys.argv[0] and os.path.abspath(sys.argv[0]) == _script:
    try:
        from lightning_speedpack.doctor.runner import DoctorSession

        DoctorSession.from_environment().install()
    except Exception as _err:  # never stop the user's rank from starting
        print(f"speedpack doctor: could not attach to this rank: {_err}", file=sys.stderr)

# Chain to the sitecustomize this one shadows, if any. This module is still being imported:
# importlib reads `sys.modules["sitecustomize"]` back when it returns, so the entry must be
# there again (ours, or the shadowed one's), or every Python process started under the doctor
# prints "Error in sitecustomize ... KeyError: 'sitecustomize'".
_this = sys.modules.pop("sitecustomize", None)
_saved = sys.path[:]
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
try:
    importlib.import_module("sitecustomize")
except ImportError:
    pass
finally:
    sys.path[:] = _saved
    if _this is not None:
        sys.modules.setdefault("sitecustomize", _this)
