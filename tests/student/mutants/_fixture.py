"""The fixture's good adapters, for a mutant to import and replace one of: `from _fixture import *`."""
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("fixture_adapters", Path(__file__).parents[1] / "tests" / "adapters.py")
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})
