"""The probes' one error type."""


class ProbeError(ValueError):
  """Bad probe input (books, lengths, spans, models); the message names the fix."""
