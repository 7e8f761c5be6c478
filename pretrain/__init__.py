"""Pretraining: BERT, ALBERT and RoBERTa encoders from a prepared corpus, MLM plus a sentence-pair
objective (NSP, SOP, DRP or none), under DeepSpeed and resumable to the exact step.

* :mod:`.instance_recipe`, :mod:`.instance_builder`: a prepared corpus and a tokenizer in, the
  pretraining *instances* (the sequences the model trains on) out (``launch/create_pretraining_data.py``);
  :mod:`.mixture` draws them from several corpora;
* :mod:`.data`, :mod:`.sampler`, :mod:`.masking`: the instances on disk, which of them each rank reads,
  and dynamic token- or whole-word masking;
* :mod:`.families`: what differs between BERT, ALBERT and RoBERTa (class, heads, pair tasks, export);
* :mod:`.modeling`, :mod:`.unpadded`, :mod:`.attention`, :mod:`.layout`, :mod:`.mlm_loss`: the model
  run on real tokens only, its attention kernels and the MLM loss;
* :mod:`.adversarial`: ALUM's adversarial loss term; :mod:`.fp8`, :mod:`.compiling`: fp8 and
  ``torch.compile``;
* :mod:`.optim`: AdamW and LAMB with their learning-rate schedules; :mod:`.initialization`: from
  scratch or from a general-domain checkpoint;
* :mod:`.trainer`: the step loop (``launch/pretrain.py``), with :mod:`.config`, :mod:`.checkpoint`,
  :mod:`.resume`, :mod:`.divergence`, :mod:`.metrics`, :mod:`.flops` and :mod:`.preemption` around it.
"""
