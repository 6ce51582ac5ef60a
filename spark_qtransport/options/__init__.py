"""The connector's options, one registry for every front end: the source's and the sink's Spark
options (`parse.ReaderOptions`, `parse.WriterOptions`), the ``sqlqueue`` command's flags that take
the same values (`cli.app.registered`) and the documentation's option tables all read
`registry.REGISTRY`. Above the transport (it builds its settings), below spark/ and cli/ (both
use it); it never imports pyspark."""
