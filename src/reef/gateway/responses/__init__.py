"""The OpenAI Responses API beside chat: body checks (``checks``), one request made
ready for a chat upstream (``turns``), a native upstream's stream relayed
(``native_relay``), and the stored responses and their routes (``stored``)."""
