"""The gateway's self-description: the OpenAPI 3.1 document (``document``), the JSON
Schemas of the inference bodies (``bodies``) and the trajectory answer
(``trajectory``), and the ``/docs`` page rendered from the document (``page``)."""
