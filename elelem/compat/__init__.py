"""Drop-in shims for code written against other libraries (issue 16, part 5)."""
