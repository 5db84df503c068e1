"""Training code shaped like public example repositories', run on the CPU and on each simulated
device.

Each workload is a tiny version, written for this test, of the model and
training loop of a public repository (named above it): its layers, loss,
optimizer and the tricks of its loop (weight tying, gradient clipping, a
closure optimizer, two optimizers, sampling ...), on synthetic data for a few
steps. From one seed it runs on ``cpu``, ``sim:0`` and ``sim:1``; the losses
and the final parameters must be equal bit for bit, since the simulated
device computes with the CPU's kernels. Then three device mistakes that these
loops invite, each checked against the words CUDA uses for it.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import simdevice as sim

DEVICES = ["sim:0", "sim:1"]


@pytest.fixture(scope="module", autouse=True)
def two_devices():
    return sim.enable(2)


def _data(*shape, seed=1, high=None):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, shape, generator=g) if high else torch.randn(*shape, generator=g)


# pytorch/examples, mnist/main.py: a CNN with dropout and max-pooling, log_softmax + nll_loss,
# Adadelta, StepLR.
def mnist_cnn(device):
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3),
        nn.ReLU(),
        nn.Conv2d(4, 8, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Dropout(0.25),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 16),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(16, 10),
        nn.LogSoftmax(dim=1),
    ).to(device)
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    x, y = _data(8, 1, 12, 12), _data(8, high=10)
    losses = []
    for _ in range(3):
        data, target = x.to(device), y.to(device)
        opt.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        opt.step()
        scheduler.step()
        losses.append(loss.item())
    return losses, model


# pytorch/examples, word_language_model/model.py and main.py: an LSTM language model whose decoder
# shares the encoder's weight, hidden state detached between batches, gradients clipped, and a
# hand-written SGD update.
class _LanguageModel(nn.Module):
    def __init__(self, tokens=20, size=8):
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.encoder = nn.Embedding(tokens, size)
        self.rnn = nn.LSTM(size, size, 2, dropout=0.2)
        self.decoder = nn.Linear(size, tokens)
        self.decoder.weight = self.encoder.weight

    def forward(self, tokens, hidden):
        output, hidden = self.rnn(self.drop(self.encoder(tokens)), hidden)
        return F.log_softmax(self.decoder(self.drop(output)), dim=-1), hidden


def word_language_model(device):
    model = _LanguageModel().to(device)
    corpus = _data(41, 2, high=20)
    hidden = tuple(torch.zeros(2, 2, 8, device=device) for _ in range(2))
    losses, lr = [], 5.0
    for start in range(0, 40, 10):
        tokens, targets = (
            corpus[start : start + 10].to(device),
            corpus[start + 1 : start + 11].to(device),
        )
        hidden = tuple(h.detach() for h in hidden)
        model.zero_grad()
        output, hidden = model(tokens, hidden)
        loss = F.nll_loss(output.view(-1, 20), targets.reshape(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        losses.append(loss.item())
    return losses, model


# pytorch/examples, vae/main.py: a VAE with the reparameterization trick, BCE + KL divergence, Adam.
class _VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc21, self.fc22 = nn.Linear(16, 8), nn.Linear(8, 2), nn.Linear(8, 2)
        self.fc3, self.fc4 = nn.Linear(2, 8), nn.Linear(8, 16)

    def forward(self, x):
        h = F.relu(self.fc1(x))
        mu, logvar = self.fc21(h), self.fc22(h)
        z = mu + torch.randn_like(logvar) * torch.exp(0.5 * logvar)
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar


def vae(device):
    model = _VAE().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.rand(6, 16, generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(3):
        data = x.to(device)
        recon, mu, logvar = model(data)
        loss = F.binary_cross_entropy(recon, data, reduction="sum") - 0.5 * torch.sum(
            1 + logvar - mu.pow(2) - logvar.exp()
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


# pytorch/examples, dcgan/main.py: transposed-convolution generator and convolutional discriminator
# with batch norm, BCELoss on real and fake labels, two Adam optimizers with beta1 = 0.5, the
# generator's step after D's.
def dcgan(device):
    netG = nn.Sequential(
        nn.ConvTranspose2d(4, 8, 4, 1, 0, bias=False),
        nn.BatchNorm2d(8),
        nn.ReLU(True),
        nn.ConvTranspose2d(8, 1, 4, 2, 1, bias=False),
        nn.Tanh(),
    ).to(device)
    netD = nn.Sequential(
        nn.Conv2d(1, 8, 4, 2, 1, bias=False),
        nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(8, 1, 4, 1, 0, bias=False),
        nn.Flatten(0),
        nn.Sigmoid(),
    ).to(device)
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    criterion = nn.BCELoss()
    real_images = _data(4, 1, 8, 8).tanh()
    losses = []
    for _ in range(2):
        real = real_images.to(device)
        netD.zero_grad()
        label = torch.full((4,), 1.0, device=device)
        errD_real = criterion(netD(real), label)
        errD_real.backward()
        fake = netG(torch.randn(4, 4, 1, 1, device=device))
        label.fill_(0.0)
        errD_fake = criterion(netD(fake.detach()), label)
        errD_fake.backward()
        optD.step()
        netG.zero_grad()
        label.fill_(1.0)
        errG = criterion(netD(fake), label)
        errG.backward()
        optG.step()
        losses += [(errD_real + errD_fake).item(), errG.item()]
    return losses, nn.ModuleList([netG, netD])


# karpathy/nanoGPT, model.py and train.py: causal self-attention through
# scaled_dot_product_attention, pre-norm blocks with GELU, tied token embedding and head, AdamW with
# and without weight decay by parameter dimension.
class _Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.c_attn, self.c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = (
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
            .transpose(1, 2)
            .contiguous()
            .view(B, T, C)
        )
        x = x + self.c_proj(y)
        return x + self.mlp(self.ln_2(x))


class _GPT(nn.Module):
    def __init__(self, vocab=16, width=8, context=6):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList([_Block(width, 2) for _ in range(2)])
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def nanogpt(device):
    model = _GPT().to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95))
    data = _data(4, 7, high=16)
    losses = []
    for _ in range(3):
        x, y = data[:, :6].to(device), data[:, 1:].contiguous().to(device)
        loss = model(x, y)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, model


# pytorch/examples, time_sequence_prediction/train.py: two stacked LSTM cells unrolled over a sine
# wave, trained with LBFGS and a closure.
class _Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1, self.lstm2, self.linear = nn.LSTMCell(1, 6), nn.LSTMCell(6, 6), nn.Linear(6, 1)

    def forward(self, inputs):
        h1 = c1 = torch.zeros(inputs.size(0), 6, dtype=inputs.dtype, device=inputs.device)
        h2 = c2 = torch.zeros_like(h1)
        outputs = []
        for step in inputs.split(1, dim=1):
            h1, c1 = self.lstm1(step, (h1, c1))
            h2, c2 = self.lstm2(h1, (h2, c2))
            outputs.append(self.linear(h2))
        return torch.cat(outputs, dim=1)


def time_sequence_prediction(device):
    model = _Sequence().double().to(device)
    wave = torch.sin(
        torch.arange(7, dtype=torch.float64).view(1, -1) / 2 + torch.arange(2.0).view(-1, 1)
    )
    inputs, targets = wave[:, :-1].to(device), wave[:, 1:].to(device)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.8, max_iter=3)
    losses = []

    def closure():
        opt.zero_grad()
        loss = F.mse_loss(model(inputs), targets)
        loss.backward()
        losses.append(loss.item())
        return loss

    for _ in range(2):
        opt.step(closure)
    return losses, model


# pytorch/tutorials, intermediate_source/seq2seq_translation_tutorial.py: a GRU encoder and an
# attention GRU decoder trained with teacher forcing, two SGD optimizers and NLLLoss.
class _AttnDecoder(nn.Module):
    def __init__(self, size=8, vocab=12, length=5):
        super().__init__()
        self.embedding = nn.Embedding(vocab, size)
        self.attn, self.attn_combine = nn.Linear(2 * size, length), nn.Linear(2 * size, size)
        self.gru, self.out = nn.GRU(size, size), nn.Linear(size, vocab)

    def forward(self, token, hidden, encoder_outputs):
        embedded = self.embedding(token).view(1, 1, -1)
        weights = F.softmax(self.attn(torch.cat((embedded[0], hidden[0]), 1)), dim=1)
        applied = torch.bmm(weights.unsqueeze(0), encoder_outputs.unsqueeze(0))
        output = F.relu(self.attn_combine(torch.cat((embedded[0], applied[0]), 1)).unsqueeze(0))
        output, hidden = self.gru(output, hidden)
        return F.log_softmax(self.out(output[0]), dim=1), hidden


def seq2seq_translation(device):
    embedding, encoder = nn.Embedding(12, 8).to(device), nn.GRU(8, 8).to(device)
    decoder = _AttnDecoder().to(device)
    params = [*embedding.parameters(), *encoder.parameters()]
    enc_opt, dec_opt = (
        torch.optim.SGD(params, lr=0.01),
        torch.optim.SGD(decoder.parameters(), lr=0.01),
    )
    source, target = _data(5, high=12), _data(4, seed=2, high=12)
    losses = []
    for _ in range(2):
        enc_opt.zero_grad()
        dec_opt.zero_grad()
        outputs, hidden = encoder(
            embedding(source.to(device)).view(5, 1, 8), torch.zeros(1, 1, 8, device=device)
        )
        token, loss = torch.tensor([[0]], device=device), 0
        for wanted in target.to(device):
            log_probs, hidden = decoder(token, hidden, outputs[:, 0])
            loss = loss + F.nll_loss(log_probs, wanted.view(1))
            token = wanted  # teacher forcing
        loss.backward()
        enc_opt.step()
        dec_opt.step()
        losses.append(loss.item() / len(target))
    return losses, nn.ModuleList([embedding, encoder, decoder])


# pytorch/examples, super_resolution/model.py: ESPCN, convolutions ending in a PixelShuffle
# upscaler, MSE, Adam.
def super_resolution(device):
    model = nn.Sequential(
        nn.Conv2d(1, 8, 5, padding=2),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 4, 3, padding=1),
        nn.PixelShuffle(2),
    ).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    low, high = _data(2, 1, 6, 6), _data(2, 1, 12, 12, seed=2)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = F.mse_loss(model(low.to(device)), high.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


# pytorch/examples, fast_neural_style/neural_style/transformer_net.py: reflection padding, instance
# norm, a residual block and upsampling by interpolation, trained on a content loss with Adam.
class _Residual(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Sequential(
            nn.ReflectionPad2d(1),
            nn.Conv2d(channels, channels, 3),
            nn.InstanceNorm2d(channels, affine=True),
        )

    def forward(self, x):
        return x + self.conv(x)


def fast_neural_style(device):
    model = nn.Sequential(
        nn.ReflectionPad2d(2),
        nn.Conv2d(3, 8, 5, stride=2),
        nn.InstanceNorm2d(8, affine=True),
        nn.ReLU(),
        _Residual(8),
        nn.Upsample(scale_factor=2, mode="nearest"),
        nn.ReflectionPad2d(1),
        nn.Conv2d(8, 3, 3),
    ).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    images = _data(2, 3, 8, 8)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        x = images.to(device)
        loss = F.mse_loss(model(x), x)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


# pytorch/examples, reinforcement_learning/reinforce.py: a policy network, actions sampled from a
# Categorical, discounted and normalized returns, the policy-gradient loss, Adam.
def reinforce(device):
    policy = nn.Sequential(
        nn.Linear(4, 16), nn.Dropout(0.6), nn.ReLU(), nn.Linear(16, 2), nn.Softmax(dim=1)
    )
    policy.to(device)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    states = _data(6, 4)
    losses = []
    for _ in range(2):
        log_probs, rewards = [], []
        for state in states:
            probs = policy(state.to(device).unsqueeze(0))
            m = torch.distributions.Categorical(probs)
            action = m.sample()
            log_probs.append(m.log_prob(action))
            rewards.append(1.0 if action.item() == 0 else 0.5)
        returns, R = [], 0.0
        for r in reversed(rewards):
            R = r + 0.99 * R
            returns.insert(0, R)
        returns = torch.tensor(returns, device=device)
        returns = (returns - returns.mean()) / (returns.std() + 1e-6)
        loss = torch.cat([-lp * R for lp, R in zip(log_probs, returns)]).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, policy


# pytorch/tutorials, beginner_source/text_sentiment_ngrams_tutorial.py: EmbeddingBag over offsets, a
# linear classifier, SGD with StepLR and gradient clipping.
def text_classification(device):
    embedding, fc = nn.EmbeddingBag(30, 8), nn.Linear(8, 4)
    model = nn.ModuleList([embedding, fc]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=5.0)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, 1.0, gamma=0.1)
    text, offsets, labels = (
        _data(20, high=30),
        torch.tensor([0, 4, 9, 15]),
        _data(4, seed=2, high=4),
    )
    losses = []
    for _ in range(3):
        opt.zero_grad()
        logits = fc(embedding(text.to(device), offsets.to(device)))
        loss = F.cross_entropy(logits, labels.to(device))
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        opt.step()
        scheduler.step()
        losses.append(loss.item())
    return losses, model


# pytorch/examples, siamese_network/main.py: twin towers sharing weights, the pair's features
# concatenated into a sigmoid head, BCELoss, Adadelta.
def siamese_network(device):
    tower = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()
    )
    head = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 1), nn.Sigmoid())
    model = nn.ModuleList([tower, head]).to(device)
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    left, right, same = (
        _data(4, 1, 6, 6),
        _data(4, 1, 6, 6, seed=2),
        _data(4, seed=3, high=2).float(),
    )
    losses = []
    for _ in range(3):
        opt.zero_grad()
        features = torch.cat([tower(left.to(device)), tower(right.to(device))], dim=1)
        loss = F.binary_cross_entropy(head(features).squeeze(1), same.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


WORKLOADS = [
    mnist_cnn,
    word_language_model,
    vae,
    dcgan,
    nanogpt,
    time_sequence_prediction,
    seq2seq_translation,
    super_resolution,
    fast_neural_style,
    reinforce,
    text_classification,
    siamese_network,
]


def _run(workload, device):
    torch.manual_seed(0)
    losses, model = workload(device)
    return losses, {name: t.detach().cpu() for name, t in model.state_dict().items()}


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.__name__)
def test_a_workload_trains_on_each_simulated_device_as_on_the_cpu(workload):
    cpu_losses, cpu_state = _run(workload, "cpu")
    assert all(math.isfinite(loss) for loss in cpu_losses)
    for device in DEVICES:
        losses, state = _run(workload, device)
        assert losses == cpu_losses, device
        assert state.keys() == cpu_state.keys()
        for name, value in state.items():
            assert torch.equal(value, cpu_state[name]), (device, name)


SAME = "Expected all tensors to be on the same device, "


def test_the_batch_left_on_the_cpu_names_the_layer_input_as_cuda_does():
    """CUDA: ``... but got mat1 is on cpu, different from other tensors on cuda:0 (when checking
    argument in method wrapper_CUDA_addmm)``, the generated device check of ``addmm``
    (``native_functions.yaml`` via torchgen)."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 10)).to("sim:1")
    with pytest.raises(RuntimeError) as info:
        model(_data(8, 1, 4, 4))
    assert (
        str(info.value) == f"{SAME}but got mat1 is on cpu, different from other tensors on sim:1 "
        "(when checking argument in method wrapper_SIM_addmm)"
    )


def test_the_images_left_on_the_cpu_give_the_convolution_type_error_cuda_gives():
    """CUDA: ``Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be the
    same or input should be a MKLDNN tensor and weight is a dense tensor`` for a batch the CPU gives
    to oneDNN (``check_input_same_type_as_parameters`` in
    ``aten/src/ATen/native/Convolution.cpp``)."""
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU()).to("sim:0")
    with pytest.raises(RuntimeError) as info:
        model(_data(16, 1, 12, 12))
    assert (
        str(info.value)
        == "Input type (torch.FloatTensor) and weight type (torch.sim.FloatTensor) should be the "
        "same or input should be a MKLDNN tensor and weight is a dense tensor"
    )


def test_a_hidden_state_made_on_the_cpu_is_named_as_cuda_names_it():
    """``init_hidden`` forgetting the device: ``nn.LSTM`` checks it in Python (``check_hidden_size``
    and ``check_forward_args`` of ``torch/nn/modules/rnn.py``), on CUDA as ``found input tensor at
    cuda:0 and hidden tensor at cpu``."""
    model = _LanguageModel().to("sim:1")
    hidden = tuple(torch.zeros(2, 2, 8) for _ in range(2))
    with pytest.raises(RuntimeError) as info:
        model(_data(10, 2, high=20).to("sim:1"), hidden)
    assert (
        str(info.value)
        == "Input and hidden tensors are not at the same device, found input tensor at sim:1 "
        "and hidden tensor at cpu"
    )
