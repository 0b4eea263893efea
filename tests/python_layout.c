/* Prints sizeof and every field's offset of the public structs as the C
 * compiler lays them out, for the Python package's ctypes mirror
 * (python/tests/test_numpy.py compares them). */
#include <stddef.h>
#include <stdio.h>

#include <clattn.h>

#define SIZE(s) printf(#s ":sizeof:%zu\n", sizeof(s))
#define FIELD(s, f) printf(#s ":" #f ":%zu\n", offsetof(s, f))

int main(void)
{
    SIZE(clattn_shape);
    FIELD(clattn_shape, batch);
    FIELD(clattn_shape, q_seq);
    FIELD(clattn_shape, kv_seq);
    FIELD(clattn_shape, num_heads);
    FIELD(clattn_shape, num_kv_heads);
    FIELD(clattn_shape, head_dim);
    FIELD(clattn_shape, causal);
    FIELD(clattn_shape, window);
    FIELD(clattn_shape, window_right);
    FIELD(clattn_shape, scale);
    FIELD(clattn_shape, dtype);
    FIELD(clattn_shape, q_offset);
    FIELD(clattn_shape, kv_offset);
    FIELD(clattn_shape, accumulate);
    FIELD(clattn_shape, cu_seqlens_q);
    FIELD(clattn_shape, cu_seqlens_kv);
    FIELD(clattn_shape, softcap);
    FIELD(clattn_shape, alibi_slopes);
    FIELD(clattn_shape, dropout_p);
    FIELD(clattn_shape, dropout_seed);
    FIELD(clattn_shape, dropout_offset);
    FIELD(clattn_shape, sinks);
    FIELD(clattn_shape, score_fn);
    FIELD(clattn_shape, mask_fn);
    FIELD(clattn_shape, score_params);
    FIELD(clattn_shape, score_params_count);
    FIELD(clattn_shape, score_native);
    FIELD(clattn_shape, score_ds_native);
    FIELD(clattn_shape, mask_native);
    FIELD(clattn_shape, bias);
    FIELD(clattn_shape, bool_mask);
    FIELD(clattn_shape, bias_batch);
    FIELD(clattn_shape, bias_heads);
    FIELD(clattn_shape, bias_cl);
    FIELD(clattn_shape, bool_mask_cl);
    FIELD(clattn_shape, score_span_native);
    FIELD(clattn_shape, bias_dtype);
    FIELD(clattn_shape, score_dp_native);
    SIZE(clattn_options);
    FIELD(clattn_options, backend);
    FIELD(clattn_options, device);
    FIELD(clattn_options, variant);
    FIELD(clattn_options, num_threads);
    SIZE(clattn_device_info);
    FIELD(clattn_device_info, backend);
    FIELD(clattn_device_info, platform_index);
    FIELD(clattn_device_info, device_index);
    FIELD(clattn_device_info, platform);
    FIELD(clattn_device_info, name);
    return 0;
}
