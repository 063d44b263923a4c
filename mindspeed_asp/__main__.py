import sys

from mindspeed_asp.cli import main

sys.exit(main())
