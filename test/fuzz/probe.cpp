// Configure-time probe (meson.build): can clang++ link a libFuzzer target with ASan and UBSan here?
extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }
