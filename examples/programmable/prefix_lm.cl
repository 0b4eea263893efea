/* Prefix-LM: the first 64 positions (the prompt) see each other both
 * ways; every later position sees causally. */
bool clattn_mask(uint b, uint h, uint q, uint k)
{
    return k < 64u || k <= q;
}
