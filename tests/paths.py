"""Where the tests' files are, for test modules in any folder of tests/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
SHARED = REPO.parent / "shared"  # beside the clone: reference checkpoints and the real MNIST files (may be absent)
