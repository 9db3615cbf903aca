"""One model's forward over its KV pool, the fastest way the step allows: a decode graph for a
pure-decode step (gpu/cuda_graphs.py), a mixed-step graph for one with prefill chunks up to
its token bucket (gpu/mixed_graphs.py), else eagerly. The target model and the draft model
(gpu/draft_runner.py) each have one.

An MLA model (DeepSeek) runs a step that its ExpandPolicy expands (a chunk of at least
mla_expand_min_tokens tokens, at most mla_expand_max_tokens cached tokens to expand) eagerly,
its prefill sequences in the expanded form (gpu/mla_layer.py): compute-bound work, where launch
overhead does not matter and the absorbed form of the graphs would spend several times the
FLOPs."""

from __future__ import annotations

import torch
from troupe.gpu.cpu_decode import CpuDecode
from troupe.gpu.cuda_graphs import DecodeGraphs
from troupe.gpu.device_inputs import NEVER, ExpandPolicy, device_metadata, host_to_device
from troupe.gpu.embed_rows import EagerRows, ImageSlice
from troupe.gpu.kv_cache import KVCache
from troupe.gpu.mixed_graphs import MixedGraphs
from troupe.gpu.models import DecoderModel
from troupe.gpu.runner_setup import RunnerOptions
from troupe.gpu.step_inputs import StepInputs


class ForwardPass:
    """Logits (model.logits_dtype) of a step's sampled rows; CUDA graphs are captured at construction."""

    @classmethod
    def for_options(cls, model: DecoderModel, kv: KVCache, options: RunnerOptions) -> ForwardPass:
        """The forward pass of a ModelRunner built with `options`."""
        return cls(
            model,
            kv,
            max_num_seqs=options.max_num_seqs,
            max_blocks_per_seq=-(-options.max_model_len // options.block_size),
            max_model_len=options.max_model_len,
            use_graphs=not options.enforce_eager,
            mixed_graph_tokens=options.mixed_graph_tokens,
            max_logits_per_seq=1 + options.num_speculative_tokens,
            mla_expand=ExpandPolicy(options.mla_expand_min_tokens, options.mla_expand_max_tokens),
            prompt_embeds=options.prompt_embeds,
        )

    def __init__(
        self,
        model: DecoderModel,
        kv: KVCache,
        *,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        max_model_len: int,
        use_graphs: bool,
        mixed_graph_tokens: int = 0,
        max_logits_per_seq: int = 1,
        mla_expand: ExpandPolicy = NEVER,
        prompt_embeds: bool = False,
    ) -> None:
        """`prompt_embeds`: steps may carry input embeddings (StepInputs.embeds); the
        mixed-step graphs then read them from buffers of their own (eagerly: always)."""
        self.model = model
        self.kv = kv
        # the model's image rows see their whole image (Gemma 3): such steps take key limits
        vision = model.vision
        self.whole_images = vision is not None and vision.config.whole_image_attention
        self.expand = mla_expand if model.config.mla is not None else NEVER
        self.graphs: DecodeGraphs | None = None
        if model.lora is not None:  # graphs capture the masked form, whatever ran before
            model.lora.slots.is_active, model.lora.slots.only_slot = True, None
        if model.device.type == "cuda" and use_graphs:
            self.graphs = DecodeGraphs(
                model,
                kv.layers,
                max_num_seqs=max_num_seqs,
                max_blocks_per_seq=max_blocks_per_seq,
                max_model_len=max_model_len,
            )
        # one CPU decoding sequence: few torch calls (gpu/cpu_decode.py), None where n/a; not
        # when an EAGLE head reads every row's hidden states (it writes none)
        cpu = model.device.type == "cpu" and model.target_hidden is None
        self.cpu_decode = CpuDecode.build(model, kv) if cpu else None
        self.mixed: MixedGraphs | None = None
        if self.graphs is not None and mixed_graph_tokens > 0:
            self.mixed = MixedGraphs(
                model,
                kv.layers,
                max_num_seqs=max_num_seqs,
                max_num_tokens=mixed_graph_tokens,
                max_logits_per_seq=max_logits_per_seq,
                max_blocks_per_seq=max_blocks_per_seq,
                max_model_len=max_model_len,
                prompt_embeds=prompt_embeds,
            )

    def __call__(self, inputs: StepInputs, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (model.logits_dtype) of the sampled rows, in order. `input_ids` (on the device) replace the
        leading inputs.input_ids (all of them, or a merged split's decodes: overlap_merge.py):
        tokens sampled by earlier work, fed without a copy to the host."""
        graphs, mixed = self.graphs, self.mixed
        # input embeddings: a decode graph takes none (a prompt's last row alone runs eagerly)
        plain = inputs.embeds is None
        graphed = (
            graphs is not None
            and plain
            and inputs.is_decode
            and graphs.can_run(len(inputs.seq_lens))
        )
        mixed_graph = (
            not graphed
            and mixed is not None
            and not inputs.is_decode
            and mixed.can_run(inputs)
            and not self._whole_images(inputs)  # their attention runs eagerly (key limits)
            and not self.expand.applies(inputs, self.kv.block_size)
        )
        if self.model.lora is not None:  # each token's adapter (gpu/lora_runtime.py)
            self.model.lora.prepare(inputs, graphed=graphed or mixed_graph)
        if graphed:
            assert graphs is not None
            logits: torch.Tensor = graphs.run(inputs, input_ids)
            if len(inputs.sampled_rows) == len(inputs.seq_lens):
                return logits  # every row samples, in order: no gather, no copy
            picked: torch.Tensor = logits[host_to_device(inputs.sampled_rows, self.model.device)]
            return picked
        if mixed_graph:
            assert mixed is not None
            return mixed.run(inputs, input_ids)
        cpu_decode, lora = self.cpu_decode, self.model.lora
        if (
            cpu_decode is not None
            and input_ids is None
            and plain
            and cpu_decode.fits(inputs)
            and (lora is None or lora.is_idle)  # it runs the base weights only
        ):
            return cpu_decode(inputs)
        out: torch.Tensor = self.model.compute_logits(self._eager(inputs, input_ids))
        return out

    def scored(self, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """A step with rows to score or pool (inputs.hidden_rows), always eager: the sampled
        rows' logits, and those rows' final hidden states (gpu/hidden_rows.py)."""
        assert inputs.hidden_rows is not None
        if self.model.lora is not None:
            self.model.lora.prepare(inputs, graphed=False)
        hidden = self._eager(inputs, None)
        num_sampled = len(hidden) - len(inputs.hidden_rows.rows)
        logits: torch.Tensor = self.model.compute_logits(hidden[:num_sampled])
        return logits, hidden[num_sampled:]

    def _eager(self, inputs: StepInputs, input_ids: torch.Tensor | None) -> torch.Tensor:
        """The final hidden states of the rows in inputs.logits_indices, launched op by op."""
        device = self.model.device
        meta = device_metadata(inputs, device, self.expand, self.kv.block_size, self.whole_images)
        if input_ids is None:
            ids = host_to_device(inputs.input_ids, device)
        elif len(input_ids) < len(inputs.input_ids):  # the rest from the host
            rest = host_to_device(inputs.input_ids[len(input_ids) :], device)
            ids = torch.cat([input_ids, rest])
        else:
            ids = input_ids
        embeds, model = inputs.embeds, self.model
        rows = None if embeds is None else EagerRows(embeds, model.dtype, device, model.vision)
        hidden: torch.Tensor = self.model(
            ids,
            host_to_device(inputs.positions, device),
            meta,
            self.kv.layers,
            rows,
        )
        return hidden

    def _whole_images(self, inputs: StepInputs) -> bool:
        """Whether the step feeds image rows that attend to their whole image."""
        if not self.whole_images or inputs.embeds is None:
            return False
        return any(isinstance(p, ImageSlice) for p in inputs.embeds.pieces)

    def close(self) -> None:
        self.graphs = self.mixed = None
