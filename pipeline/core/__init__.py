"""The foundation: errors, ids, file I/O, text fields, redaction, the one registry class,
data folders, argument helpers, progress, every config section's base, source hashes and
model weight files. Imports nothing of the project above it."""
