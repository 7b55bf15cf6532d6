"""The upstream side of the OpenAI Responses API: a Responses request made a chat
completions request and its answer made a Responses object again (``translate``), and
the Responses event stream assembled from chat chunks or a finished response
(``stream``).

The gateway side (body checks, the conversation a request continues, the stored
responses and their routes, the relay of a native upstream's stream) is
``reef.gateway.responses``. The embedded engine serves no Responses API: its
``reef.engine.bodies`` are the chat and text completion bodies it answers with.
"""
