// SPDX-License-Identifier: MIT
// Writes the lines of tests/data/arch_logits_ref.txt for one model: llama.cpp's logits (top 8 per
// position) for the random-weight models tests/model/test_arch_ref builds. Test-generation time only,
// against a llama.cpp build (libllama; no AMX in ggml-cpu):
//   PKV_ARCH_REF_KEEP=/tmp/arch build/tests/model/test_arch_ref    # writes the models, prints tokens
//   g++ -O1 -I$LLAMA/include -I$LLAMA/ggml/include tests/model/gen_arch_ref.cpp -o gen_arch_ref \
//       -L$LLAMA_BUILD/bin -lllama -lggml -lggml-base -Wl,-rpath,$LLAMA_BUILD/bin
//   ./gen_arch_ref /tmp/arch/qwen2.gguf qwen2 TOKENS... >> tests/data/arch_logits_ref.txt
#include "llama.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <vector>

static void errors_only(ggml_log_level level, const char *text, void *)
{
	if (level >= GGML_LOG_LEVEL_ERROR)
		fputs(text, stderr);
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: gen_arch_ref MODEL.gguf NAME TOKEN...\n");
		return 2;
	}
	llama_log_set(errors_only, nullptr);
	llama_backend_init();
	llama_model *model = llama_model_load_from_file(argv[1], llama_model_default_params());
	if (!model)
		return 1;
	std::vector<llama_token> toks;
	for (int i = 3; i < argc; i++)
		toks.push_back(atoi(argv[i]));
	llama_context_params cp = llama_context_default_params();
	cp.n_ctx = cp.n_batch = 256;
	cp.type_k = cp.type_v = GGML_TYPE_F32; // the KV as the model client keeps it
	llama_context *ctx = llama_init_from_model(model, cp);
	llama_batch batch = llama_batch_init((int32_t)toks.size(), 0, 1);
	for (size_t i = 0; i < toks.size(); i++) {
		batch.token[i] = toks[i];
		batch.pos[i] = (llama_pos)i;
		batch.n_seq_id[i] = 1;
		batch.seq_id[i][0] = 0;
		batch.logits[i] = 1;
	}
	batch.n_tokens = (int32_t)toks.size();
	if (!ctx || llama_decode(ctx, batch))
		return 1;
	int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
	for (size_t i = 0; i < toks.size(); i++) {
		const float *l = llama_get_logits_ith(ctx, (int32_t)i);
		std::vector<int> ids(n_vocab);
		std::iota(ids.begin(), ids.end(), 0);
		std::partial_sort(ids.begin(), ids.begin() + 8, ids.end(), [l](int a, int b) { return l[a] > l[b]; });
		printf("%s %zu", argv[2], i);
		for (int k = 0; k < 8; k++)
			printf(" %d:%.5f", ids[k], l[ids[k]]);
		printf("\n");
	}
	llama_batch_free(batch);
	llama_free(ctx);
	llama_model_free(model);
	return 0;
}
