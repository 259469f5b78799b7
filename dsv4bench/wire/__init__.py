"""The wire: one HTTP exchange with a server and what its bytes become (transport, client, SSE
assembly, charsets, bounds). Imports history (the records it fills) and loop; nothing above.
"""
