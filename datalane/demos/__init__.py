"""The demos: what ``datalane demo`` runs, with no cluster.

* :mod:`~datalane.demos.elastic`: 4 rank processes, resumed on 2, then on 8 (``datalane demo``;
  ``make demo``);
* :mod:`~datalane.demos.sidecars`: the same through sidecar processes, Unix sockets and a
  checkpoint store (``datalane demo --sidecars``);
* :mod:`~datalane.demos.torchtitan` and its ranks :mod:`~datalane.demos.torchtitan_rank`:
  TorchTitan's debug llama3 on CPU (``make demo-torchtitan``);
* :mod:`~datalane.demos.vlm`, its ranks :mod:`~datalane.demos.vlm_rank` and the model
  :mod:`~datalane.demos.vlm_model`: a tiny Qwen3.5 vision-language model on CPU on image-caption
  pairs, resized between DP degrees (``make demo-vlm``);
* :mod:`~datalane.demos.vlm_samples`: the picture of one step's images, captions and loss
  masks in docs/vlm.md (``python -m datalane.demos.vlm_samples``).

Their corpus comes from :mod:`datalane.testing`.
"""
