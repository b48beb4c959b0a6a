"""`python -m hpcring.bench`: run the benchmark on every rank and exit with its status.

The first call's cost is measured here, before the bench imports hpcring's engine
(`hpcring.bench.startup`)."""

import sys

from ..errors import abort_on_error
from .startup import first_call

if __name__ == "__main__":
    with abort_on_error():  # an exception on one rank ends the job instead of hanging the others
        startup = first_call()
        from .cli import main

        sys.exit(main(startup=startup))
