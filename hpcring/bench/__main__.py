"""`python -m hpcring.bench`: run the benchmark on every rank and exit with its status."""

import sys

from ..errors import abort_on_error
from .cli import main

if __name__ == "__main__":
    with abort_on_error():  # an exception on one rank ends the job instead of hanging the others
        sys.exit(main())
