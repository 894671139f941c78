#include "archspace/train/loss.h"

#include "archspace/train/batches.h"

namespace archspace {

LossSums next_token_loss(const at::Tensor& logits, const at::Tensor& labels, double z_loss_coeff) {
  const int64_t V = logits.size(-1);
  at::Tensor flat = logits.reshape({-1, V}).to(at::kFloat);
  at::Tensor target = labels.reshape({-1});
  at::Tensor valid = target != kIgnoreIndex;
  at::Tensor lse = at::logsumexp(flat, -1);
  at::Tensor picked = flat.gather(1, target.clamp_min(0).unsqueeze(1)).squeeze(1);
  at::Tensor mask = valid.to(at::kFloat);
  return {((lse - picked) * mask).sum(), (lse.pow(2) * mask).sum() * z_loss_coeff, valid.sum().item<int64_t>()};
}

}  // namespace archspace
