"""The pure scheduling core: no I/O, no asyncio, no clock reads (time comes in as `now`)."""
