"""`python -m spark_qtransport.cli`: the sqlqueue command line."""

from . import main

main()
