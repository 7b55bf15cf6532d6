"""The upstream side of the OpenAI Responses API: a Responses request made a chat
completions request and its answer made a Responses object again (``translate``), the
Responses event stream assembled from chat chunks or a finished response (``stream``),
and the relays that carry a chat, Anthropic or native Responses upstream's stream to a
Responses client (``relay``).

The gateway side (body checks, the conversation a request continues, the stored
responses and their routes, the stream's receipt) is ``reef.gateway.responses``. The
embedded engine serves no Responses API: its ``reef.engine.bodies`` are the chat and
text completion bodies it answers with.
"""
