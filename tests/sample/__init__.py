"""Tests of the sample project and its demo (``sampleproject/``)."""
