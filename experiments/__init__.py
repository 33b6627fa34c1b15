"""The project's experiments and the demo's data, run by the scripts in ``scripts/``; not part of the installed
package: associative recall (``recall``), the real-data comparison (``real_data``) and the demo's generated text
(``synthetic_text``)."""
