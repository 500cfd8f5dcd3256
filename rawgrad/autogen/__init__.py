# Generated ctypes bindings live here, made by tools/autogen.py from the real C headers.
# None are generated yet (they arrive with the GPU drivers). Never edit them by hand.
