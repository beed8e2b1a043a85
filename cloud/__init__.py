"""The cloud side of zodiac-edge: the Spark materialisation job and its command line.

Nothing here imports pyspark at import time: the edge install has no pyspark, and ``import
cloud`` (or ``zodiac-cloud --help``) must work there. Spark code lives in :mod:`cloud.spark`,
whose modules import pyspark only when a Spark function is actually called.
"""
