"""The archive of every candidate ever proposed, and what people do with it: the SQLite store and its typed records
(store, records, schema), browsing and comparing candidates (browse), the HTML report and batch summaries (report,
batch_summary), exporting a kernel as one file or the whole archive as JSON Lines (export, transfer), and re-checking
winners when the environment changes (reverify)."""
