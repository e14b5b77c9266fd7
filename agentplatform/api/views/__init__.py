"""One API class per resource URL; each HTTP method is one operation."""
